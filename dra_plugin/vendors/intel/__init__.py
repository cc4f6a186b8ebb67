"""intel"""
