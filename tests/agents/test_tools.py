from __future__ import annotations

from collections.abc import Mapping

from agentcache_agents import Call, KnowledgeBase, Workspace, parse_action, parse_calls
from agentcache_agents.swe import parse_command


def test_parse_action() -> None:
    assert parse_action(" hmm\nAction 2: Search[Ada Lovelace]\n") == ("Search", "Ada Lovelace")
    assert parse_action("action: finish[London]") == ("Finish", "London")
    assert parse_action("Action 1: Jump[x]") is None
    assert parse_action("Search[x] without the label") is None


def test_parse_calls_literals_only() -> None:
    text = (
        "thinking...\n"
        'core_memory_append(label="human", content="likes tea")\n'
        "send_message(message=open('/etc/passwd').read())\n"
        'delete_everything(now="yes")\n'
        "send_message('positional')\n"
        'send_message(message="done")'
    )
    calls = parse_calls(text, {"core_memory_append", "send_message"})
    assert calls == [
        Call("core_memory_append", {"label": "human", "content": "likes tea"}),
        Call("send_message", {"message": "done"}),
    ]
    assert calls[0].render() == 'core_memory_append(label="human", content="likes tea")'
    assert parse_calls(calls[0].render(), {"core_memory_append"}) == calls[:1]


def test_parse_command() -> None:
    assert parse_command(" look.\n```bash\ncat calc.py\nls\n```") == "cat calc.py"
    assert parse_command("```\npytest") == "pytest"
    assert parse_command("I will run\n$ grep add calc.py") == "grep add calc.py"
    assert parse_command("no command here") is None
    assert parse_command("```bash\n\n```") is None


def check(files: Mapping[str, str]) -> tuple[bool, str]:
    ok = "return a + b" in files["src/calc.py"]
    return ok, "1 passed" if ok else "FAILED test_add"


def test_workspace_commands() -> None:
    ws = Workspace({"src/calc.py": "def add(a, b):\n    return a - b\n", "README": "hi\n"}, check)
    assert ws.run("ls") == ws.run("ls -la") == "README\nsrc"
    assert ws.run("cd nowhere").endswith("No such file or directory")
    assert ws.run("cd src") == "" and ws.run("pwd") == "/repo/src"
    assert ws.run("cat calc.py") == "   1  def add(a, b):\n   2      return a - b"
    assert ws.open_file == "/repo/src/calc.py"
    assert ws.run("grep return calc.py") == "calc.py:2:    return a - b"
    assert ws.run("pytest") == "FAILED test_add"
    assert ws.run("sed -i 's/a - b/a + b/' calc.py") == ""
    assert ws.run("pytest") == "1 passed"
    assert ws.run("echo x > ../notes.txt") == "" and ws.files["/repo/notes.txt"] == "x\n"
    assert ws.run("rm -rf /") == "bash: rm: command not found"
    assert ws.run("cat 'unterminated").startswith("bash: syntax error")
    assert not ws.submitted and ws.run("submit") == "Submitted." and ws.submitted


def test_knowledge_base() -> None:
    text = "He designed engines. He was born in London. Born 1791."
    kb = KnowledgeBase({"Charles Babbage": text})
    assert kb.lookup("born") == "No passage is open: Search first."
    assert "Similar: ['Charles Babbage']" in kb.search("Babbage")
    assert kb.search("charles babbage").startswith("He designed")
    assert kb.lookup("born") == "(Result 1 / 2) He was born in London."
    assert kb.lookup("born") == "(Result 2 / 2) Born 1791."
    assert kb.lookup("born") == "No more results."
