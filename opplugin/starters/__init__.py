"""Starter kernels that `opplugin new OP FILE` copies: one per op type with a user-kernel contract."""
