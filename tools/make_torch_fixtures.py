# Writes small torch.save files with real PyTorch, and the values they hold as JSON.
import json, os, sys, collections
import torch
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
g = torch.Generator().manual_seed(7)
base = torch.randn(4, 3, generator=g)
sd = collections.OrderedDict()
sd["a.weight"] = torch.randn(3, 4, generator=g)
sd["b.half"] = torch.randn(5, generator=g).half()
sd["c.bf16"] = torch.randn(2, 3, generator=g).bfloat16()
sd["d.base"] = base
sd["e.transposed"] = base.t()          # a view: same storage, strides (1, 3)
sd["f.slice"] = base[1:, 1]            # a view with a storage offset
sd["g.long"] = torch.tensor([1, -2, 3], dtype=torch.int64)
sd["h.scalar"] = torch.tensor(2.5)
top = {"bert": sd, "decoder": {"module.x.weight_g": torch.ones(2, 1, 1), "module.x.weight_v": torch.randn(2, 3, 4, generator=g)}}
torch.save(top, f"{out}/state.pth")
voice = torch.randn(4, 1, 8, generator=g)
torch.save(voice, f"{out}/voice.pt")
def vals(t):
    return {"shape": list(t.shape), "dtype": str(t.dtype), "values": t.float().flatten().tolist()}
want = {"bert": {k: vals(v) for k, v in sd.items()},
        "decoder": {k: vals(v) for k, v in top["decoder"].items()},
        "voice": vals(voice), "torch": torch.__version__}
json.dump(want, open(f"{out}/expected.json", "w"), indent=1)
print(torch.__version__, os.path.getsize(f"{out}/state.pth"), os.path.getsize(f"{out}/voice.pt"))
# Check a round trip with real torch of a file written by tools (if present).
