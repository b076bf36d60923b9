"""The mechanisms, one folder each, found through synth.registry. A mechanism never imports
another mechanism."""
