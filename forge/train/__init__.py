"""forge.train"""
