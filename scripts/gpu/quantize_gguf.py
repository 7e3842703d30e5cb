#!/usr/bin/env python3
"""Requantize the 2-D weights of an F16 GGUF (../shared/tools/make_gguf.py's output) to one
type with the gguf package's reference quantizers (norms stay F32), for the GPU benchmarks.

    python3 quantize_gguf.py IN.gguf OUT.gguf Q4_0|Q4_1|Q8_0|Q4_K|Q6_K
"""
import sys

import numpy as np
import gguf
from gguf import quants


def main(src, dst, qname):
    qtype = gguf.GGMLQuantizationType[qname]
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"]
    w = gguf.GGUFWriter(dst, bytes(arch.parts[arch.data[0]]).decode())
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            sub = f.types[1] if len(f.types) > 1 else None
            if sub == gguf.GGUFValueType.STRING:
                val = [bytes(f.parts[i]) for i in f.data]
            else:
                val = [f.parts[i].tolist()[0] for i in f.data]
            w.add_key_value(name, val, vt, sub_type=sub)
        elif vt == gguf.GGUFValueType.STRING:
            w.add_key_value(name, bytes(f.parts[f.data[0]]).decode(), vt)
        else:
            w.add_key_value(name, f.parts[f.data[0]].tolist()[0], vt)
    for t in r.tensors:
        data = np.asarray(t.data)
        if len(t.data.shape) == 2 and t.tensor_type == gguf.GGMLQuantizationType.F16:
            q = quants.quantize(data.astype(np.float32), qtype)
            w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=qtype)
        else:
            w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
