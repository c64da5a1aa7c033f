"""Fits of the hardware descriptions' constants on measured data (each fit a script can print
and a test can check; the fitted numbers live in the hardware TOML files with their source)."""
