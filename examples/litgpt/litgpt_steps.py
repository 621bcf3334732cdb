"""`litgpt pretrain` for a number of optimizer steps: litgpt's pretrain.py (0.5.13) stops on
--train.max_tokens only (it accepts --train.max_steps with a warning and never reads it), so the run
length recipetune asks for becomes tokens here.

    python litgpt_steps.py STEPS TOKENS_PER_STEP [litgpt pretrain arguments ...]
"""

import sys

from litgpt.__main__ import main

steps, tokens_per_step, *args = sys.argv[1:]
sys.argv = ["litgpt", "pretrain", *args, f"--train.max_tokens={int(steps) * int(tokens_per_step)}"]
main()
