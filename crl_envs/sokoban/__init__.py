"""Sokoban: a seeded reverse-play generator, a BFS solver, and the text env."""
