"""Seeing what a server did: the doctor's rules over a start log, the testinfra suites' reports."""
