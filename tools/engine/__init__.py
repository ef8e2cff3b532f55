"""The series engine: the pinned bases fetched, the series read, applied and checked.

``fetch`` and ``releases`` (the bases and the index), ``series`` and ``apply`` (read and apply
the patches), ``checkout``, ``port`` and ``faithful`` (a line's stages as git, ported, compared),
``verify``, ``fixed_by_plugin`` and ``final_record`` (the fixed_by tests on every stage), and
``venvs`` and ``lock`` (each line's test environment and its constraints). Imports ``tools.shared``
only.
"""
