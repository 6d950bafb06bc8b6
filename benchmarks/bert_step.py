"""How far one fine-tuning step of Table 1's stand-in study is from its arithmetic, measured side by side.

    python benchmarks/bert_step.py [--settings normal "g1 + negative"] [--batches 6]

For each setting, the packaged all-MiniLM-L6-v2 (modified as the setting says) takes the first
training batches of seed 0 in the study's own order, with its dynamic padding, one thread (what
each of a full run's two worker processes has). Printed per setting: the seconds of a step
(forward, backward, AdamW), the same with subnormal floats flushed to zero, the share of the
AdamW update, the floating-point operations of the forward and backward matrix products
counted by ``torch.utils.flop_counter`` at the batches' padded lengths (the real tokens' count is
printed beside; AdamW and the elementwise work are not counted), and a bound: those operations at
this machine's measured matrix-product rate, one thread, at the step's largest product (tokens x
hidden times hidden x intermediate). A ratio near 1 leaves little to gain without computing less
(fewer padded tokens) or in lower precision. Timings on a shared machine move; the ratios
measured in one run move less.
"""

import argparse
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from icl_lens.bert.glue import TASKS, batches, load_data
from icl_lens.bert.modify import modify_bert
from icl_lens.studies import table1


def setting_batches(study, setting, count):
    """(model, optimizer, the first ``count`` training batches of seed 0) of one setting."""
    config = study.glue_config(setting, study.epochs)
    train, _ = load_data(config)
    torch.manual_seed(0)
    model, tokenizer = table1.classifier(study, config, TASKS[config.task][2])
    modify_bert(model, **config.switches, seed=0)
    model.train()
    loader = batches(tokenizer, train, config, order=torch.Generator().manual_seed(0))
    chosen = [batch for _, batch in zip(range(count), loader)]
    return model, torch.optim.AdamW(model.parameters(), lr=config.lr, fused=True), chosen


def step(model, optimizer, inputs, labels):
    loss = model(**inputs, labels=labels).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def matmul_rate(tokens, hidden, intermediate, repeats=10):
    """Floating-point operations per second of a (tokens, hidden) x (hidden, intermediate) product."""
    a, b = torch.randn(tokens, hidden), torch.randn(hidden, intermediate)
    torch.mm(a, b)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    return 2 * tokens * hidden * intermediate * repeats / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", default=["normal", "g1 + negative"])
    parser.add_argument("--batches", type=int, default=6)
    args = parser.parse_args()
    torch.set_num_threads(1)
    study = table1.StudyConfig()
    print(f"torch {torch.__version__}, 1 thread, batch {study.batch}")
    for setting in args.settings:
        model, optimizer, chosen = setting_batches(study, setting, args.batches)
        step(model, optimizer, *chosen[0])   # warm-up
        timed = chosen[1:]
        start = time.perf_counter()
        for inputs, labels in timed:
            step(model, optimizer, inputs, labels)
        seconds = (time.perf_counter() - start) / len(timed)
        torch.set_flush_denormal(True)   # as icl_lens.training.loop.train does for the attention layers
        start = time.perf_counter()
        for inputs, labels in timed:
            step(model, optimizer, inputs, labels)
        flushed = (time.perf_counter() - start) / len(timed)
        torch.set_flush_denormal(False)
        start = time.perf_counter()
        for _ in timed:
            optimizer.step()
        update = (time.perf_counter() - start) / len(timed)
        with FlopCounterMode(display=False) as counter:
            for inputs, labels in timed:
                model(**inputs, labels=labels).loss.backward()
        flops = counter.get_total_flops() / len(timed)
        optimizer.zero_grad()
        tokens = sum(int(inputs["attention_mask"].sum()) for inputs, _ in timed) / len(timed)
        padded = sum(inputs["input_ids"].numel() for inputs, _ in timed) / len(timed)
        config = model.config
        rate = matmul_rate(int(padded), config.hidden_size, config.intermediate_size)
        bound = flops / rate
        print(f"{setting:<14} step {seconds:6.3f} s ({flushed:6.3f} s with subnormals flushed; AdamW "
              f"{update / seconds:4.0%}) | {flops / 1e9:6.1f} GFLOP at "
              f"{padded:.0f} padded tokens ({tokens:.0f} real) | matmul {rate / 1e9:5.1f} GFLOP/s, bound "
              f"{bound:6.3f} s, step / bound {seconds / bound:4.2f}", flush=True)


if __name__ == "__main__":
    main()
