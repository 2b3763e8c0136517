"""Print each rollout row's tokens/s and its share of the floor from `jetd bench --json` files."""
import json
import sys

for path in sys.argv[1:]:
    try:
        j = json.load(open(path))
    except Exception as e:  # a failed run leaves no JSON: say so and go on
        print(path, "no json:", e)
        continue
    print(j.get("device"))
    for r in j["rollout"]:
        print(f"{r['flow']:6} b{r['batch']:<4} tok/s {r['tokens_per_s']:9.0f} of_floor {100 * r['of_floor']:5.1f}%"
              f"  decode tok/s {r['decode_tokens_per_s']:9.0f} decode_of_floor {100 * r['decode_of_floor']:5.1f}%")
