"""Layouts other runtimes load: hybridrt's graph, adapted to another program's directory and
graph interface (docs/interop.md).

- layouts: `export --layout`, the checks and the transformers.js directory;
- tjs_graph, tjs_names: the graph interface and cache names transformers.js expects;
- genai: onnxruntime-genai's directory and genai_config.json;
- files: what the layouts share (the prelude of mask lengths, metadata, external data).

Each layout wraps an export (hybridrt.export) and is written atomically around it.
"""
