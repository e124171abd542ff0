"""Which files a stage's change may touch and which modules its package owns:
path rules, line-scoped permissions, files that load themselves, module ownership.
"""
