"""MiniHack tasks on the real NetHack engine (nle), rendered as text."""
