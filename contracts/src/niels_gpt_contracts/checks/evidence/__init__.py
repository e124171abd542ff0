"""Whether the contract is exercised: tests claim every invariant, oracle
drivers sweep every declared axis, device reports are there and fresh.
"""
