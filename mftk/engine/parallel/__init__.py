"""Distributed building blocks (groups, CPU-safe collectives, DP/FSDP, TP+SP, PP) over msrun workers."""
