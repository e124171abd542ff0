"""The kinds of spec rule, one module each (``rules.spec_rules.RuleKind``): its
TOML keys, the checks a schema cannot express, its words and its check.
``rules.spec_rules.rule_kinds`` imports every module here; nothing else lists them.
"""
