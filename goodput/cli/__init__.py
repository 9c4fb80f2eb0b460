"""The ``goodput`` command line: a thin layer over the library."""
