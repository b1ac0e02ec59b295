"""The software stack on a host: the ml-env venv's check and its lock file."""
