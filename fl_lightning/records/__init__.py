"""Torch-free: the run vocabulary, the file formats and store access that the leaderboard rests on."""
