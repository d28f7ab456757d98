"""python3 -m unittest scripts.bench.test_check_docs: check_docs on synthetic docs."""

import os
import tempfile
import unittest

from . import check_docs

DATA = {
    "commands.main.ratios.script_over_allow_compact": 7.3612,
    "memory.used.10.bytes.compact": 170.0,
    "fallback.admissions.usec.details": 20.456,
}


class CheckDocs(unittest.TestCase):
    def write(self, text):
        folder = tempfile.mkdtemp()
        path = os.path.join(folder, "doc.md")
        with open(path, "w") as f:
            f.write(text)
        self.addCleanup(lambda: (os.remove(path), os.rmdir(folder)))
        return path

    def test_quotes_that_agree_with_the_data_pass(self):
        path = self.write(
            "The script costs 7.36x<!-- bench:commands.main.ratios.script_over_allow_compact --> "
            "the compact call, and 7.4x<!-- bench:commands.main.ratios.script_over_allow_compact --> "
            "rounded; a window of 10 takes 170<!-- bench:memory.used.10.bytes.compact --> B.\n"
        )
        self.assertEqual(check_docs.check([path], DATA), [])

    def test_one_key_quoted_twice_with_two_values_fails(self):
        path = self.write(
            "| ALLOW / ZADD | 0.71x<!-- bench:commands.main.ratios.script_over_allow_compact --> |\n"
            "Elsewhere: 0.79x<!-- bench:commands.main.ratios.script_over_allow_compact -->.\n"
        )
        failures = check_docs.check([path], DATA)
        self.assertTrue(any("quoted as 0.79, but as 0.71" in f for f in failures), failures)
        self.assertTrue(any("the data has 7.36" in f for f in failures), failures)

    def test_a_quote_that_differs_from_the_data_fails(self):
        path = self.write(
            "It costs 20.5<!-- bench:fallback.admissions.usec.details --> usec, "
            "or 1,170<!-- bench:memory.used.10.bytes.compact --> B.\n"
        )
        failures = check_docs.check([path], DATA)
        self.assertEqual(len(failures), 1, failures)
        self.assertIn("quotes 1170, the data has 170", failures[0])

    def test_an_unknown_key_and_a_marker_without_a_figure_fail(self):
        path = self.write("about 3<!-- bench:no.such.key --> and some<!-- bench:memory.used.10.bytes.compact -->\n")
        failures = check_docs.check([path], DATA)
        self.assertEqual(len(failures), 2, failures)
        self.assertIn("which the data does not hold", failures[0])
        self.assertIn("no figure right before it", failures[1])


if __name__ == "__main__":
    unittest.main()
