"""The pass/fail tally of the test scripts in tests/ (test_*.py): each check prints a FAIL
line (and, unless quiet, an ok line), and finish() prints `N passed, N failed` and gives the
exit status, 1 on any failure."""


class Tally:
    def __init__(self, quiet=False):
        self.passed, self.failed, self.quiet = 0, 0, quiet

    def check(self, cond, what, detail=""):
        if cond:
            self.passed += 1
            if not self.quiet:
                print("ok    %s" % what)
        else:
            self.failed += 1
            print("FAIL  %s%s" % (what, (": " + detail) if detail else ""))
        return cond

    def finish(self):
        print("%d passed, %d failed" % (self.passed, self.failed))
        return 1 if self.failed else 0
