"""forge.export"""
