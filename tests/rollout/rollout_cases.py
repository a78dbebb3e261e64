"""Small rollout jobs shared by the rollout tests."""

from __future__ import annotations

import copy


def job_dict(**over) -> dict:
    d = {
        "kind": "rollout",
        "name": "tiny",
        "cluster": {"groups": [{"name": "trainer", "device": "H100-SXM", "count": 2},
                               {"name": "a100", "device": "A100-80GB", "count": 6},
                               {"name": "l4", "device": "L4", "count": 2}],
                    "interconnect": "infiniband-hdr"},
        "rollout": {
            "trainer": "trainer",
            "workers": [{"group": "a100", "bits": 16}, {"group": "l4", "bits": 8}],
            "model": {"preset": "llama-3-8b", "max_positions": 32768},
            "workload": {"prompts_per_step": 8, "group_size": 4, "prompt_len": 256,
                         "response": {"median": 300, "p99": 3000}, "max_len": 4000},
            "policy": {"kind": "trajectory-async"},
            "repack": {"method": "none", "batch_cap": 16, "interval_s": 1.0},
            "steps": 6,
        },
    }
    d = copy.deepcopy(d)
    for path, v in over.items():
        node = d
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = v
    return d
