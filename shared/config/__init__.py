"""Settings declared once, their flags and file keys, the frozen configs both sides read, placement."""
