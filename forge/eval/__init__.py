"""forge.eval"""
