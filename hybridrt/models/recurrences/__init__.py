"""The recurrences in PyTorch, as prompt-length-independent graphs: the chunked linear scan
(Mamba1), the SSD scan (Mamba2) and the chunked gated delta rule (Gated DeltaNet). The fused
ops (models/ops) run these as their reference and replace them with onnxruntime operators."""
