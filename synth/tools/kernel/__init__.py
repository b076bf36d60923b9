"""The random-feature kernel embedding and the generator fitted to it (DP-MERF): the
mechanism `merf` and PrivImage's frequency warm-up both use it."""
