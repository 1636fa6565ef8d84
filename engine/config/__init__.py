"""The manifest (``contextful.toml``): parsed once into frozen dataclasses, validated all at once.

``load_manifest(project_dir)`` returns a :class:`Manifest` or raises ``ManifestInvalid`` listing
every problem, each named by its spec error. The reference for every key is docs/manifest.md.
"""

from contextful.engine.config.manifest import ControlSpec, ExternalSpec, Manifest, PipelineSpec, SourceSpec
from contextful.engine.config.parse import load_manifest, parse_manifest

__all__ = ["ControlSpec", "ExternalSpec", "Manifest", "PipelineSpec", "SourceSpec", "load_manifest", "parse_manifest"]
