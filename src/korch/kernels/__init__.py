"""Kernel generators and library backends (the only stage besides the runtime that imports TVM)."""
