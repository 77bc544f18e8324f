"""Our CustomResourceDefinitions (``worker.gpustack.ai/v1alpha1``).

- :mod:`.crds`: the definitions, and applying them;
- :mod:`.crddocs`: what ``kubectl explain`` says, a description for every schema field.
"""
