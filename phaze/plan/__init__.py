"""The plan and its exports: the plan as ``phazec`` writes it (``plan_output.py``: its JSON
and text), its summary (``summary.py``) with its regime's error band (``error_bands.py``), a
compiled point's plan placed again (``plan_template.py``) and the plan as Megatron-LM or
torchtitan arguments (``export.py``, ``--export``)."""
