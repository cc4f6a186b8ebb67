"""vendors"""
