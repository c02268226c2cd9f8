"""The simulated provider: scripted model answers in process (:class:`SimulatedModel`) or over
HTTP on both wires (``clonefleet provider serve``), with its rate limits and its prompt cache.

The package is part of :mod:`clonefleet.providers`, which exports what others use.
"""
