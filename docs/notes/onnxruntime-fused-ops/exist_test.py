import numpy as np, onnx, onnxruntime as ort
from onnx import helper as h, TensorProto as TP
def exists(op, n_in, n_out, domain='com.microsoft', opset=21, dtype=TP.FLOAT, **attrs):
    ins=[h.make_tensor_value_info(f'i{j}',dtype,None) for j in range(n_in)]
    node=h.make_node(op,[f'i{j}' for j in range(n_in)],[f'o{j}' for j in range(n_out)],domain=domain,**attrs)
    m=h.make_model(h.make_graph([node],'g',ins,[onnx.ValueInfoProto(name=f'o{j}') for j in range(n_out)]),opset_imports=[h.make_opsetid('',opset),h.make_opsetid('com.microsoft',1)]); m.ir_version=10
    so=ort.SessionOptions(); so.graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        s=ort.InferenceSession(m.SerializeToString(),so,providers=['CPUExecutionProvider']); return 'YES'
    except Exception as e: return 'NO: '+str(e).split(':')[-1][:110].strip()
tests=[('SwiGLU',2,1,'com.microsoft',21,{}),('SwiGLU',2,1,'',28,{}),('MatMulNBitsMlp',6,1,'com.microsoft',21,dict(K=32,N=8,block_size=32,activation='silu')),
('MatMulNBitsQkv',9,3,'com.microsoft',21,dict(K=32,Nq=8,Nkv=8,block_size=32)),('Mamba2Verify',10,3,'com.microsoft',21,dict(heads=2,n_groups=1)),
('GatedAdd',3,1,'com.microsoft',21,{}),('ScaledSiLU',1,1,'com.microsoft',21,{}),('LinearAttentionGate',4,2,'com.microsoft',21,{}),
('RMSNormRotary',5,1,'com.microsoft',21,dict(rotary_embedding_dim=8)),('GatedRMSNorm',3,1,'com.microsoft',21,{}),('BranchwiseRMSNorm',2,1,'com.microsoft',21,{}),
('LinearAttention',6,2,'',27,dict(q_num_heads=1,kv_num_heads=1)),('CausalConvWithState',2,2,'',27,{}),('RMSNormalization',2,1,'',23,{}),('Attention',3,1,'',24,{}),
('MultiHeadAttention',3,1,'com.microsoft',21,dict(num_heads=2)),('DecoderMaskedMultiHeadAttention',3,1,'com.microsoft',21,dict(num_heads=2)),
('PagedAttention',3,1,'com.microsoft',21,dict(num_heads=2,kv_num_heads=2)),('SparseAttention',3,1,'com.microsoft',21,dict(num_heads=2,kv_num_heads=2)),
('FusedMatMul',2,1,'com.microsoft',21,{}),('QuickGelu',1,1,'com.microsoft',21,{}),('FastGelu',1,1,'com.microsoft',21,{}),('Gelu',1,1,'com.microsoft',21,{}),
('MoE',5,1,'com.microsoft',21,{}),('SkipLayerNormalization',3,1,'com.microsoft',21,{}),('EngramGate',2,1,'com.microsoft',21,{}),('MatMulPacked',2,1,'com.microsoft',21,{}),
('VarlenCausalConvWithState',5,2,'com.microsoft',21,{}),('GatedDeltaNet',7,2,'com.microsoft',21,{})]
for op,ni,no,dom,ops,at in tests:
    print(f'{(dom or "ai.onnx")}::{op} (opset {ops}) CPU:', exists(op,ni,no,dom,ops,**at))
