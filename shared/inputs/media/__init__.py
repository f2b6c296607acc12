"""A media model's input stage (torch-free): its plan turns a call's texts and ``MediaInput``s into ids + items.

A worker that serves a media model (``workers.models.media``) sends, with its
tokenizer files, a ``media`` dict (``TokenizerFiles.media``): ``{"plan": NAME,
...}`` with what that plan needs (the processor's settings from the model's
``preprocessor_config.json``, the image token, the prompts). ``plan_for``
builds the named plan from ``plans.PLANS``; the input stage
(``shared.inputs.stage``) hands it every call of that model, text-only ones
too (a SigLIP text is padded as the model was trained; a ColPali query gets
its prefix). A plan decodes its media (``shared.inputs.media.decode``, under the
call's ``MediaLimits``), runs the model's processor and returns the
``Encoded`` ids with each sequence's ``MediaItem``s; it raises
``InvalidRequest`` (a 400 naming the part) for what the model cannot read.
Each plan is one module here and one ``plans.PLANS`` entry.
"""
