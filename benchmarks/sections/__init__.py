"""The sections of docs/performance.md, one module each.

Each module owns its section's heading (defined once, as `HEADING` or in the benchmark module
that renders it), the run that produces its numbers and figures, and the markdown made from
them; it ends with `SECTION`, which `benchmarks.figures` lists to run the sections and
assemble the document. The heading is how a partial run (`--sections`) finds a section's text in
the earlier document to keep it, so it must be spelt in one place only.
"""
