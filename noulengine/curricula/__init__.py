"""Training curricula: generators of canonical training records, labelled by rule or from the
train-side pools' own labels. They write the rows that ``noulengine train`` reads; the training loop
(:mod:`noulengine.train`) never imports them (``tests/test_layout.py`` checks it).

* :mod:`~noulengine.curricula.procedural`: 13 small task kinds at levels 0-4 (choice, score, noul),
  exact rule-computed answers and posteriors;
* :mod:`~noulengine.curricula.scenarios`: workflow evidence (agent traces, invoices, security alerts,
  support threads, tool catalogues) with rule-computed answers;
* :mod:`~noulengine.curricula.toolrl`: tool selection from ToolRL's train rows;
* :mod:`~noulengine.curricula.nouls`: yes/no statements from the train pools' labels;
* :mod:`~noulengine.curricula.reworded`: suite questions re-asked with renamed labels, paraphrased
  descriptions, distractor options, jailbreak framings.

The default model's recipe (``scripts/train_default.py``) mixes them into its data file.
"""
