"""edged's TensorRT-LLM calls against the real package's source (tensorrt-llm 1.x, installed
with pip into .cache/gpu-api/ without its dependencies, and read, never imported: importing it
needs torch and a GPU): the backend runs on the double (tests/doubles/fake_tensorrt_llm.py),
which records every class, member and keyword edged used; each must exist in the real source:
the LLM's arguments among its LlmArgs fields, SamplingParams', KvCacheConfig's and
GuidedDecodingParams' fields, generate_async's keywords, RequestOutput's abort and iteration,
CompletionOutput's diffs, the tokenizer's methods, and the names edged imports. Skipped, with
the reason, where pip cannot fetch the package (it is large, and NVIDIA's index may be out of
reach)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from doubles import fake_tensorrt_llm
from doubles.fake_tensorrt_llm import write_model
from realmods import Target, install

from edged.backends import Sampling, register_backend
from edged.backends.base import LoadSpec
from edged.backends.tensorrt_llm import TensorRTLLMBackend
from edged.model.config import LanguageConfig

TARGET = Target("trtllm-1", "tensorrt-llm==1.*", "tensorrt_llm")


def source_names(root: Path) -> dict[str, set[str]]:
    """Every class in the package: the names its body defines (fields, methods, properties),
    merged across classes of one name; and "<module>:<file>" for each module's top level."""
    names: dict[str, set[str]] = {}
    for path in (root / "tensorrt_llm").rglob("*.py"):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        module = path.relative_to(root).with_suffix("").as_posix().replace("/", ".")
        top = names.setdefault(f"<module>:{module}", set())
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                top.update(alias.asname or alias.name for alias in node.names)
            elif isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                top.add(node.name)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            members = names.setdefault(node.name, set())
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
                elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    members.add(item.name)
                    if item.name == "generate_async":
                        members.update(f"generate_async:{a.arg}" for a in
                                       item.args.args + item.args.kwonlyargs)
    return names


def exercise(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_tensorrt_llm.SURFACE.clear()
    fake_tensorrt_llm.install(monkeypatch)
    register_backend("tensorrt_llm", "edged.backends.tensorrt_llm:TensorRTLLMBackend")
    folder = write_model(tmp_path / "trtllm")
    session = TensorRTLLMBackend().load(LoadSpec("chat", 1, folder, (), (), 0, llm=LanguageConfig(
        context=64, sequences=2)), None)  # type: ignore[arg-type]
    try:
        for prompt, sampling in ((session.prompt("1 2"), Sampling(3, 0.0, stop=(" 4",))),
                                 (session.chat([{"role": "user", "content": "hi"}]),
                                  Sampling(2, 0.8, seed=3, json_schema='{"type": "object"}')),
                                 (session.prompt("x"), Sampling(2, 0.0, json_schema="{}"))):
            list(session.generate(prompt, sampling))
        slot = session.admit(session.prompt("1"), Sampling(50, 0.0))
        session.step()
        session.drop(slot)  # aborted under way
    finally:
        session.close()


def test_tensorrt_llm_when_edged_uses_its_api_every_name_exists_in_the_real_package(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    exercise(monkeypatch, tmp_path)
    used = set(fake_tensorrt_llm.SURFACE)
    assert {row[0] for row in used} >= {"LLM", "SamplingParams", "KvCacheConfig",
                                        "GuidedDecodingParams", "RequestOutput",
                                        "CompletionOutput", "TransformersTokenizer"}
    names = source_names(install(TARGET))
    fields = {"LLM": names.get("BaseLlmArgs", set()) | names.get("TorchLlmArgs", set())
              | names.get("TrtLlmArgs", set()) | {"model"},
              "RequestOutput": names.get("GenerationResult", set())
              | names.get("RequestOutput", set())}
    missing = []
    for cls, member, detail in sorted(used):
        real = fields.get(cls, names.get(cls, set()))
        if member == "__init__":
            wanted = {k for k in detail.split(",") if k}
        elif member == "generate_async":
            wanted = {"generate_async"} | {f"generate_async:{k.split('=')[0]}" for k in
                                           detail.split(",") if k}
        else:
            wanted = {member} if member not in ("__iter__",) else {"__iter__", "__next__"}
        missing += [f"{cls}.{name}" for name in sorted(wanted - real)]
    exported = names.get("<module>:tensorrt_llm.__init__", set())
    api = names.get("<module>:tensorrt_llm.llmapi.__init__", set())
    missing += [f"tensorrt_llm.{n}" for n in ("LLM", "SamplingParams") if n not in exported]
    missing += [f"tensorrt_llm.llmapi.{n}" for n in ("KvCacheConfig", "GuidedDecodingParams")
                if n not in api]
    assert not missing, f"edged uses what the real tensorrt_llm lacks: {missing}"
