"""Exercise 10.5's grader (mgpu_utils.grading.coding.case_studies, check_gan_step), round 2 of issue 55: the GAN
step written other ways (one batch through D with the loss doubled, softplus losses, D's fakes made under
no_grad, the modules' zero_grad, D frozen during G's step) passes; G's loss on detached fakes, D's loss halved,
the losses returned as tensors or in the other order (the grader now checks what each step returns) and G's
loss through D's output from before D's step get the hint that names them. Each list is graded in one launch at
3 ranks."""
import re

from helpers import wrong
from mgpu_utils.grading.runner import grade_many

D_LOSS = ("    d_loss = F.binary_cross_entropy_with_logits(D(real), ones) \\\n"
          "        + F.binary_cross_entropy_with_logits(D(fake.detach()), zeros)      "
          "# detach: G stays out of D's backward\n")
G_LOSS = "    g_loss = F.binary_cross_entropy_with_logits(D(fake), ones)             # through the updated D\n"
FAKE = "    fake = G(z)\n"
RETURN = "    return d_loss.item(), g_loss.item()\n"

RIGHT = {   # name: (text of the solution, replaced by)
    "real and fakes through D in one batch, the loss doubled": (
        D_LOSS, "    d_loss = 2 * F.binary_cross_entropy_with_logits(D(torch.cat([real, fake.detach()])),\n"
                "                                                    torch.cat([ones, zeros]))\n"),
    "the losses written with softplus": (
        [D_LOSS, G_LOSS],
        ["    d_loss = F.softplus(-D(real)).mean() + F.softplus(D(fake.detach())).mean()\n",
         "    g_loss = F.softplus(-D(fake)).mean()\n"]),
    "D's fakes made under no_grad, G run again for its own step": (
        [FAKE, D_LOSS, G_LOSS],
        ["    with torch.no_grad():\n        fake = G(z)\n",
         D_LOSS.replace("fake.detach()", "fake"),
         "    g_loss = F.binary_cross_entropy_with_logits(D(G(z)), ones)\n"]),
    "the modules' zero_grad": (
        ["    opt_d.zero_grad(set_to_none=True)\n", "    opt_g.zero_grad(set_to_none=True)\n"],
        ["    D.zero_grad()\n", "    G.zero_grad()\n"]),
    "D frozen during G's step": (
        G_LOSS, "    D.requires_grad_(False)\n" + G_LOSS + "    D.requires_grad_(True)\n"),
}

WRONG = {   # name: (text of the solution, replaced by, the hint it must get at 3 ranks)
    "G's loss on detached fakes": (
        G_LOSS, G_LOSS.replace("D(fake)", "D(fake.detach())"),
        r"G never changed, and no gradient reached it: G's loss must go back through G, D\(fake\), not "
        r"D\(fake.detach\(\)\)"),
    "real and fakes through D in one batch, the mean of both": (
        D_LOSS, "    d_loss = F.binary_cross_entropy_with_logits(D(torch.cat([real, fake.detach()])),\n"
                "                                                torch.cat([ones, zeros]))\n",
        r"the parameters are those of D's loss halved: the mean over real and fakes in one batch"),
    "the losses returned as tensors": (
        RETURN, "    return d_loss, g_loss\n",
        r"G and D are right, but gan_step returned \(Tensor, Tensor\): return \(d_loss, g_loss\) as Python floats"),
    "the losses returned in the other order": (RETURN, "    return g_loss.item(), d_loss.item()\n",
                                               r"G and D are right, but the losses returned are \(g_loss, d_loss\)"),
    "G's loss from D's output before D's step": (
        [D_LOSS, G_LOSS],
        [D_LOSS + "    d_fake = D(fake)\n", "    g_loss = F.binary_cross_entropy_with_logits(d_fake, ones)\n"],
        r"the step failed: one of the variables needed for gradient computation has been modified by an inplace "
        r"operation.* G's loss went back through D's output from before opt_d.step\(\)"),
}


def _cases(tmp_path, table):
    out = []
    for k, (name, (old, new, *_)) in enumerate(table.items()):
        (tmp_path / str(k)).mkdir()
        out.append(("10.5", wrong(tmp_path / str(k), "10.5", old, new)))
    return out


def test_right_gan_steps_pass(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, RIGHT), 3)
    assert hints == [None] * len(RIGHT), dict(zip(RIGHT, hints))


def test_wrong_gan_steps_get_their_hints(tmp_path, starts_processes):
    hints = grade_many(_cases(tmp_path, WRONG), 3)
    for (name, (*_, want)), hint in zip(WRONG.items(), hints):
        assert hint and re.search(want, hint), (name, hint)


#: Right and wrong variants per exercise in this file (test_runner.py counts them against issue 55's bar).
COUNTS = {"10.5": (len(RIGHT), len(WRONG))}
