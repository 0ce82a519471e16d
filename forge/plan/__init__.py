"""forge.plan"""
