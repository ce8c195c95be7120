"""Plain helpers every layer may use: files written whole, where opplugin's files live, row ranges, host threads, text tables,
the reduced-precision number formats."""
