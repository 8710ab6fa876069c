"""The `python` tool: runs code (given, or written by the LLM from a task) once, in the sandbox."""

from __future__ import annotations

import ast
import asyncio
import io
import re
import sys
import time
import tokenize
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentflow.engines.base import Message
from agentflow.errors import ConfigError, SandboxUnavailableError, ToolError, ToolTimeoutError
from agentflow.textsafe import word_set
from agentflow.tools.base import Tool, ToolContext, ToolExample, ToolResult, ToolSettings, register_tool
from agentflow.tools.sandbox import Isolation, SandboxResult, check_isolation, run_python_sandboxed
from agentflow.tools.sandbox.levels import explain_failure, unavailable_message

CODE_WRITER_SYSTEM = (
    "You write short Python 3 programs. Reply with one ```python code block and nothing else. "
    "The program must print() its final result. Prefer the standard library (math, fractions, itertools); "
    "there is no network, no input and no subprocess."
)

# Two worked examples before the task: small models copy their shape (one short print) instead of writing
# long functions that the token limit cuts off. Measured on the bundled 135M model: 7 of 8 arithmetic tasks
# right with them, 1 of 5 without.
CODE_WRITER_EXAMPLES: tuple[tuple[str, str], ...] = (
    ("Compute 15 * 42", "```python\nprint(15 * 42)\n```"),
    ("Add 120, 35 and 7", "```python\nprint(120 + 35 + 7)\n```"),
)

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def strip_comments(code: str) -> str:
    """`code` without its comments, each line's trailing space dropped; code that does not tokenize, or is
    longer than `MAX_ECHO_CHARS`, is returned as is (it runs, or fails, as written).

    A comment never runs, yet later steps read the program: the bundled 135M executor writes
    `print(886 * 762)  # 886 * 762 = 3778488888...` and the generator answered 3778488 beside the printed
    675132 (4 of 30 sampled compute questions)."""
    if len(code) > MAX_ECHO_CHARS:
        return code
    lines = io.StringIO(code).readlines()  # the lines tokenize numbers (split at \n only)
    try:
        comments = [tok.start for tok in tokenize.generate_tokens(io.StringIO(code).readline)
                    if tok.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):  # IndentationError is a SyntaxError
        return code
    if not comments:
        return code
    for row, col in comments:
        line = lines[row - 1]
        lines[row - 1] = line[:col].rstrip() + line[len(line.rstrip("\r\n")):]
    return "".join(lines).strip("\n")


class PythonInput(BaseModel):
    """Exactly one of `code` (run as given, without its comments) or `task` (the LLM writes the code)."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field("", description="Python code to run; print() the result.")
    task: str = Field("", description="A computation in words; code is written for it.")

    @field_validator("code")
    @classmethod
    def _without_comments(cls, code: str) -> str:
        return strip_comments(code)

    @model_validator(mode="after")
    def _exactly_one(self) -> PythonInput:
        if bool(self.code.strip()) == bool(self.task.strip()):
            raise ValueError("give exactly one of 'code' or 'task'")
        return self


class PythonSettings(ToolSettings):
    timeout_s: float = Field(10.0, gt=0, description="Wall-clock limit of one run; the process group is killed.")
    cpu_s: float | None = Field(None, gt=0, description="CPU-seconds limit; default: the wall-clock limit.")
    memory_mb: int = Field(512, ge=64, description="Memory of the whole run (all its processes, files and shared "
                           "memory) where a cgroup per run can be made, else the address space of each process.")
    max_output_chars: int = Field(4000, ge=100, description="Kept of each of stdout and stderr (head + tail).")
    max_file_mb: int = Field(16, ge=1, description="Largest file the code may write.")
    disk_mb: int = Field(64, ge=1, description="Kernel level: size of the working folder (a tmpfs of the run's).")
    max_files: int = Field(2048, ge=16, description="Kernel level: files and folders the working folder holds.")
    max_processes: int = Field(16, ge=1, description="Processes (and threads) of the code at once.")
    python: str | None = Field(None, description="Interpreter to run; default: the one running agentflow.")
    isolation: Isolation = Field(
        "kernel", description="'kernel': namespaces, Landlock and seccomp confine the code, or the tool refuses to "
        "run; 'process': only limits and an audit hook (not safe against hostile code), warned once and recorded.")
    read_paths: list[str] = Field(
        default_factory=list, description="Folders or files the code may also read (kernel level), besides the "
        "system libraries and the interpreter's own library folders; nothing else is visible to it.")
    network_namespace: bool = Field(True, description="Process level: isolate the network with `unshare`, if allowed.")


def extract_code(reply: str) -> str:
    """The code in an LLM reply: the first fenced block (even if unterminated), else the whole text."""
    match = _FENCE.search(reply)
    return (match.group(1) if match else reply).strip()


MAX_ECHO_CHARS = 100_000
"""Longest code `echo_last_expression` parses and `strip_comments` tokenizes; longer code runs as written (parsing
20 MB took 31 s)."""
_LINE_END = re.compile(r"\r\n|\r|\n")  # the parser's line breaks; str.splitlines() also breaks at \f, U+2028...


def echo_last_expression(code: str) -> str:
    """`code` changed to print the value of a final bare expression, as the Python REPL shows it.

    `6873 * 683` alone prints 4694259, as in a notebook cell; `x = 1` and a final `print(...)` are unchanged,
    and a value of None prints nothing. Never raises: code that does not parse, is longer than `MAX_ECHO_CHARS`
    or nests too deep is returned as is (its error is the result). The rewrite is checked: everything before the
    last expression parses to the same statements as in `code`, or `code` is returned as is.
    """
    if len(code) > MAX_ECHO_CHARS:
        return code
    try:
        return _echo(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError, UnicodeError):  # what parsing hostile text raises
        return code


def _echo(code: str) -> str:
    tree = ast.parse(code)
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr):
        return code
    call = last.value
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print":
        return code
    starts = [0] + [match.end() for match in _LINE_END.finditer(code)]
    line = code[starts[last.lineno - 1]:]
    # col_offset counts UTF-8 bytes, not characters
    head = code[:starts[last.lineno - 1]] + line.encode()[:last.col_offset].decode()
    expression = ast.get_source_segment(code, last.value)
    if expression is None:
        return code
    program = (f"{head}__value = ({expression})\n"
               "if __value is not None:\n    print(repr(__value))\n")
    rewritten = ast.parse(program).body
    same = (len(rewritten) == len(tree.body) + 1
            and ast.dump(ast.Module(rewritten[:-2], [])) == ast.dump(ast.Module(tree.body[:-1], []))
            and ast.dump(rewritten[-2].value) == ast.dump(last.value))  # type: ignore[attr-defined]
    return program if same else code


MAX_CAUSE_CHARS = 200
"""The longest exception line `exception_line` repeats in the error sentence."""


def exception_line(stderr: str) -> str:
    """The exception a Python traceback ends with (`NameError: name 'x' is not defined`), or "" when stderr holds
    no traceback. The tool's error sentence names it first: memory keeps the head of each result
    (`limits.result_chars`, 100 to 200 characters in the shipped CPU configs), which otherwise held only
    `Traceback (most recent call last):` and the planner and generator never read why the code failed."""
    if "Traceback (most recent call last):" not in stderr:
        return ""
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    return last if len(last) <= MAX_CAUSE_CHARS else last[:MAX_CAUSE_CHARS - 1] + "…"


class CopiedExampleError(ToolError):
    """The code writer answered its worked example instead of the task (small models copy the last example)."""

    kind = "copied_example"


def copied_code_example(code: str, asked: str) -> str | None:
    """The worked example's task whose code `code` repeats, when that code carries something of the example
    (its numbers, its names) that the task and question lack: the same rule as the executor's
    `copied_example`, so a generic program that happens to match is no leak."""
    for example_task, example_reply in CODE_WRITER_EXAMPLES:
        if extract_code(example_reply) != code.strip():
            continue
        if word_set(code) & word_set(example_task) - word_set(asked):
            return example_task
    return None


@register_tool
class PythonTool(Tool):
    name = "python"
    description = ("Runs Python code in a sandbox and returns what it prints. "
                   "Give 'code' to run, or 'task' to have the code written for you.")
    input_model = PythonInput
    output_description = "The printed output (stdout); on failure also the error and traceback."
    limitations = ("Runs once within {timeout:g} s and {memory} MB; no network, no subprocesses, no files "
                   "outside a temporary folder; only printed values come back.")
    best_practices = ("Use it for arithmetic, counting and exact computation; print() the final value "
                      "(a final bare expression is printed, as in a notebook). The code can read `question` (the "
                      "question) and `steps` (what the earlier steps' tools returned, as strings, oldest first).")
    settings_model = PythonSettings
    uses_llm = True
    fallback_field = "task"
    examples = (ToolExample(question="What is 15 * 42?", sub_goal="Compute 15 * 42", input={"code": "print(15 * 42)"}),)

    settings: PythonSettings

    def card(self) -> dict[str, Any]:
        card = super().card()
        card["limitations"] = self.limitations.format(timeout=self.settings.timeout_s,
                                                      memory=self.settings.memory_mb)
        return card

    async def check(self) -> None:
        """Refuse early, naming what the kernel lacks, when the configured isolation level cannot hold here."""
        await check_isolation(self.settings.python or sys.executable, self.settings.isolation)

    def executor_schema(self) -> dict[str, Any]:
        # The executor writes the code itself: one model call instead of two; `task` stays for direct use
        # and for engines without constrained decoding.
        return {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"],
                "additionalProperties": False}

    async def run(self, args: PythonInput, ctx: ToolContext) -> ToolResult:
        start = time.perf_counter()
        llm_calls: list[dict[str, Any]] = []
        code = args.code if args.code.strip() else await self._write_code(args.task, ctx, llm_calls)
        program = await asyncio.to_thread(echo_last_expression, code)  # off the event loop
        budget = min(self.settings.timeout_s, ctx.timeout_s - (time.perf_counter() - start))
        if budget <= 0:
            raise ToolTimeoutError("no time left to run the code after writing it")
        try:
            result = await run_python_sandboxed(
                program, timeout_s=budget, cpu_s=self.settings.cpu_s, memory_mb=self.settings.memory_mb,
                max_output_chars=self.settings.max_output_chars, max_file_mb=self.settings.max_file_mb,
                disk_mb=self.settings.disk_mb, max_files=self.settings.max_files,
                max_processes=self.settings.max_processes,
                python=self.settings.python or sys.executable, isolation=self.settings.isolation,
                read_paths=self.settings.read_paths, network_namespace=self.settings.network_namespace,
                names={"question": ctx.question, "steps": list(ctx.steps)})
        except OSError as err:
            raise ConfigError(f"python tool: cannot start the interpreter "
                              f"{self.settings.python or sys.executable!r}: {err}") from err
        if result.setup_error is not None:  # reported by the sandbox itself, never read from the code's output
            reason = explain_failure(f"agentflow-sandbox: {result.setup_error}")
            raise SandboxUnavailableError(unavailable_message(reason))
        if result.timed_out:
            partial = result.stdout.strip()[-300:]
            raise ToolTimeoutError(f"the code ran longer than {budget:.1f}s and was killed"
                                   + (f"; its output so far: {partial}" if partial else ""))
        return ToolResult(output=self._render(result), data=self._data(code, result), truncated=result.truncated,
                          llm_calls=llm_calls)

    async def _write_code(self, task: str, ctx: ToolContext, llm_calls: list[dict[str, Any]]) -> str:
        if ctx.llm is None:
            raise ConfigError("python tool: 'task' needs an LLM to write the code, and none is bound; "
                              "give 'code' instead")
        messages: list[Message] = [{"role": "system", "content": CODE_WRITER_SYSTEM}]
        for example_task, example_reply in CODE_WRITER_EXAMPLES:
            messages += [{"role": "user", "content": f"Task: {example_task}"},
                         {"role": "assistant", "content": example_reply}]
        messages.append({"role": "user", "content": f"Task: {task}"})
        completion = await ctx.llm(messages)
        llm_calls.append({"role": "tools", "messages": messages, "completion": completion.model_dump()})
        code = extract_code(completion.text)
        if not code:
            raise ToolError("the LLM wrote no code for the task")
        copied = copied_code_example(code, f"{task} {ctx.question}")
        if copied is not None:
            raise CopiedExampleError(f"the code writer repeated its worked example for {copied!r} ({code.strip()}) "
                                     f"instead of code for the task {task!r}; not run")
        return code

    def _render(self, result: SandboxResult) -> str:
        stdout = result.stdout.rstrip()
        if result.ok:
            return stdout or "(the code printed nothing; print() the result)"
        if result.memory_error:
            problem = f"the code ran out of memory (limit {self.settings.memory_mb} MB)"
        elif result.cpu_limit:
            problem = "the code used up its CPU-time limit and was killed"
        elif result.signal:
            problem = f"the code was killed by {result.signal}"
        else:
            problem = f"the code failed (exit code {result.exit_code})"
        parts = [stdout] if stdout else []
        cause = exception_line(result.stderr)
        parts.append(f"Error: {problem}: {cause}" if cause else f"Error: {problem}.")
        if result.stderr.strip():
            parts.append(result.stderr.rstrip())
        return "\n".join(parts)

    @staticmethod
    def _data(code: str, result: SandboxResult) -> dict[str, Any]:
        return {"code": code, **result.model_dump(), "ok": result.ok}
