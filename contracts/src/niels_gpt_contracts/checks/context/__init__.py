"""What is judged: a tree's specs in dependency order, the PR under judgement,
and which stages a change reaches (imports and spec-kit use).
"""
