"""Compiler: canonical requests to packed token trees with readout terms."""

from noulengine.compile.compiler import DEBIAS_MODES, Compiler, CompilerConfig
from noulengine.compile.layout import READOUT_MODES, CompiledRequest, QuestionPlan
from noulengine.compile.render import LAYOUTS, PROMPT_VERSION, prompt_version
from noulengine.compile.symbols import SYMBOLS

__all__ = ["Compiler", "CompilerConfig", "CompiledRequest", "DEBIAS_MODES", "LAYOUTS", "PROMPT_VERSION", "QuestionPlan",
           "READOUT_MODES", "SYMBOLS", "prompt_version"]
