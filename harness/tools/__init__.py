"""The library's own tools behind ``harness <tool>`` (``plan``, ``submit``, ``build-data``, ``gguf-to-hf``,
``prepare-eval``, ``prepare-cluster``): each module's ``main(argv)``, registered under the entry-point group
``harness.tools`` in ``pyproject.toml``; ``scripts/<name>.py`` is a thin front for the same function."""
