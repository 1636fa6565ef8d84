"""Registered bodies pin their implementation and each declared dependency by digest
(``run.own.body-implementation``, ``run.own.body-dependencies``)."""

from __future__ import annotations

import importlib
import importlib.metadata
import uuid
from pathlib import Path
from types import ModuleType

import pytest
from contextful.engine.run.bodies import (
    BODY_PIN,
    IMPLEMENTATION_PIN,
    TYPE_PIN,
    BodyRegistry,
    package_version,
)
from contextful.engine.run.execution import open_execution, plan_reference
from contextful.engine.run.owners import Scope
from contextful.storage.clock import ManualClock
from contextful.storage.errors import (
    ArgumentInvalid,
    BodyIdentityConfigured,
    BodyUnregistered,
    OwnerPinsMismatch,
)
from contextful.storage.journal import open_journal_store

SOURCE = '''
def summarize(text):
    return text[:{cut}]


class Labeler:
    def __call__(self, text):
        return "label"
'''


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: int = 10) -> ModuleType:
    name = f"host_bodies_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(SOURCE.format(cut=cut))
    monkeypatch.syspath_prepend(str(tmp_path))
    return importlib.import_module(name)


@pytest.mark.clause("run.own.body-implementation")
def test_the_implementation_pin_is_the_hosts_digest_of_the_loaded_code_and_its_type(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module(tmp_path, monkeypatch)
    before = BodyRegistry().register("summarize", module.summarize)
    assert before.type_name == f"{module.__name__}.summarize" and before.package_version == "unpackaged"
    labeler = BodyRegistry().register("label", module.Labeler())  # a callable object: its concrete class
    assert labeler.type_name == f"{module.__name__}.Labeler"
    assert labeler.implementation != before.implementation  # same module, another registered type

    Path(module.__file__ or "").write_text(SOURCE.format(cut=20))  # the host's code changes
    after = BodyRegistry().register("summarize", importlib.reload(module).summarize)
    assert after.implementation != before.implementation and after.type_name == before.type_name
    assert after.pins()[IMPLEMENTATION_PIN] == after.implementation != before.pins()[IMPLEMENTATION_PIN]
    assert after.pins()[TYPE_PIN] == before.pins()[TYPE_PIN] and after.pins()[BODY_PIN] == "summarize"

    # an owner pinned to the old implementation refuses a claim under the new one
    journal = open_journal_store("sqlite", path=str(tmp_path / "journal.sqlite"))
    clock = ManualClock()
    pending = open_execution(journal, Scope.host("job:summaries"), "a" * 64, holder="old", lease_s=30, clock=clock,
                             pins=before.pins(input_identity="docs@3"))
    clock.advance(31)
    with pytest.raises(OwnerPinsMismatch) as info:
        open_execution(journal, Scope.host("job:summaries"), "a" * 64, holder="new", clock=clock,
                       pins=after.pins(input_identity="docs@3"))
    assert info.value.execution == pending.execution_id
    assert before.implementation in str(info.value) and after.implementation in str(info.value)
    journal.close_store()

    packaged = BodyRegistry().register("plan", plan_reference)  # code of an installed package: its version
    assert packaged.package_version == importlib.metadata.version("contextful") == package_version("contextful")


@pytest.mark.clause("run.own.body-implementation")
def test_configuration_selects_a_body_by_name_and_supplies_no_implementation_identity(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = BodyRegistry()
    body = registry.register("summarize", _module(tmp_path, monkeypatch).summarize)
    assert registry.select("summarize") is body and registry.select({"name": "summarize"}) is body
    with pytest.raises(BodyIdentityConfigured) as info:
        registry.select({"name": "summarize", "digest": body.implementation})  # even the right digest
    assert info.value.body == "summarize" and info.value.keys == ("digest",)
    assert "by name only" in str(info.value)
    with pytest.raises(BodyIdentityConfigured):
        registry.select({"name": "summarize", "type": body.type_name, "version": "9"})
    with pytest.raises(BodyUnregistered) as unknown:
        registry.select("sumarize")
    assert unknown.value.known == ("summarize",)


@pytest.mark.clause("run.own.body-dependencies")
def test_each_declared_dependency_has_its_own_digest_apart_from_structural_declarations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fn = _module(tmp_path, monkeypatch).summarize
    declared = {"prompts": {"system": "Summarize in one line.", "style": "plain"},
                "providers": {"llm": {"provider": "example", "model": "m-1", "temperature": 0}},
                "policies": {"retention": "30d"}, "inputs": ("text",), "outputs": ("summary",)}
    base = BodyRegistry().register("summarize", fn, **declared).pins()
    assert {k for k in base if k.startswith("dep.")} == {"dep.prompt:system", "dep.prompt:style",
                                                         "dep.provider:llm", "dep.policy:retention"}

    def changed(**change: object) -> set[str]:
        pins = BodyRegistry().register("summarize", fn, **{**declared, **change}).pins()
        assert pins.keys() == base.keys()
        return {k for k in pins if pins[k] != base[k]}

    assert changed(prompts={"system": "Summarize in two lines.", "style": "plain"}) == {"dep.prompt:system"}
    assert changed(providers={"llm": {"provider": "example", "model": "m-2", "temperature": 0}}) == {
        "dep.provider:llm"}
    assert changed(policies={"retention": "90d"}) == {"dep.policy:retention"}
    assert changed(inputs=("text", "lang"), outputs=("summary", "score")) == set()  # the plan pins structure

    with pytest.raises(ArgumentInvalid) as leak:  # credential values have no field in provider semantics
        BodyRegistry().register("summarize", fn, providers={"llm": {"model": "m-1", "api_key": "sk-x"}})
    assert "api_key" in str(leak.value) and "sk-x" not in str(leak.value)
