"""Rules on a stage's source, read without importing it: readable source,
what imported names resolve to (``_name_probe``), the spec's static rules,
and no device-type branches.
"""
