"""nvidia"""
