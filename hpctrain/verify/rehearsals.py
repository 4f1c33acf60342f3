"""Does the rehearsal hold for every layout? ``python -m hpctrain.verify.rehearsals`` rehearses every case of
the parity table (:mod:`hpctrain.verify.parity`: every layout hpctrain has, on each model it is run with:
GPT, ViT, a long-context GPT under CP, a mixture of experts under EP, LoRA) and sets each rehearsed rank's
parameter, gradient and optimizer bytes beside the planner's (:func:`hpctrain.plan.memory.rank_state_bytes`).

Exit status 0 when every rank of every case started and agrees within 1 %; else 1, with the rows that did
not. The gradients compared are the trained parameters' shards (a rehearsal runs no backward: what a backward
makes whole, the planner counts on top; ``hpctrain plan --rehearse`` says how much).
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpctrain.verify.rehearsals", description=__doc__)
    parser.add_argument("--models", nargs="*", help="only these models (default: every model of the table)")
    args = parser.parse_args(argv)

    from hpctrain.config.compose import compose, to_typed
    from hpctrain.plan.check import check_run
    from hpctrain.plan.layout import layout_of
    from hpctrain.plan.rehearsal import AGREE, compared, planned
    from hpctrain.task.rehearse import StartupFailure, rehearse
    from hpctrain.verify.parity import CASES, EXTRA_CASES, overrides

    began = time.perf_counter()
    cases = ranks = 0
    bad: list[str] = []
    for case in [*CASES, *EXTRA_CASES]:
        for model in case.models:
            if args.models and model not in args.models:
                continue
            cfg = to_typed(compose(overrides(case, model)))
            check_run(cfg)
            lay = layout_of(cfg)
            cases += 1
            try:
                done = rehearse(cfg)
            except StartupFailure as failure:
                bad.append(f"{model:<8} {case.name}: {failure}")
                continue
            for r in done:
                ranks += 1
                for what, (est, got) in compared(planned(cfg, lay, r), r).items():
                    if abs(est - got) > AGREE * max(got, 1):
                        where = f"{model:<8} {case.name}, rank {r.role.rank} ({r.role})"
                        bad.append(f"{where}: {what} planned {est}, rehearsed {got}")
    print("\n".join(bad))
    verdict = "every rank agrees with the planner within 1%" if not bad else f"{len(bad)} disagreements"
    print(f"{cases} cases, {ranks} ranks rehearsed in {time.perf_counter() - began:.1f} s: {verdict}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
