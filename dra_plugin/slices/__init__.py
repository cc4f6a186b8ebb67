"""slices"""
