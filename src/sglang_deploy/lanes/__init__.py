"""The stack lanes: ``catalog`` (the lanes this checkout ships, each ``<lane>.yml`` loaded and checked),
``lock`` (a lane's lock file) and ``cudaversion`` (CUDA toolkit versions)."""
