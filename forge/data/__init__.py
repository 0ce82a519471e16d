"""forge.data"""
