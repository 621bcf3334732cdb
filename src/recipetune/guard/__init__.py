"""The control system: static checks, loss parity, throughput significance, the final verdict."""
