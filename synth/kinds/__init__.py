"""Data kinds: the formats and readers of what a dataset holds (images and photographs,
NIfTI head volumes), each with its checks on the way in."""
