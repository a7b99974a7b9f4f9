"""The one warning peft raises on transformers 5 that no noulengine user can act on.

peft (0.21.2, the newest release) reads ``model.is_gradient_checkpointing`` in
``PeftModel.__init__``; transformers 5 renamed that property ``is_activation_checkpointing`` and
warns on every read of the old name. So every command that loads the default model (a base plus a
LoRA adapter) or trains one printed ``FutureWarning: `is_gradient_checkpointing` is deprecated``.
noulengine never reads the property itself: the two calls into peft (loading an adapter, wrapping a
model for LoRA training) run inside :func:`quiet_peft_checkpointing_warning`, which hides exactly
that message and nothing else (tests/test_peft_warnings.py fails if it comes back).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Iterator

PEFT_CHECKPOINTING_WARNING = r"`is_gradient_checkpointing` is deprecated"  # a regex for warnings' message=


@contextmanager
def quiet_peft_checkpointing_warning() -> Iterator[None]:
    """Run the block with transformers' ``is_gradient_checkpointing`` FutureWarning ignored; every
    other warning (and that one outside the block) is shown as configured."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PEFT_CHECKPOINTING_WARNING, category=FutureWarning)
        yield
