"""Notebook widgets: ask a trained model a question."""
import ipywidgets as widgets


class AskWidget:
    """A text box and a button; the answer of `predict([question])[0]` appears below.

    `predict` is any strings-in, strings-out callable, e.g. a `t5nb.decode.Predictor`.
    """

    def __init__(self, predict, placeholder: str = "Where was Ada Klimberg born?"):
        self.predict = predict
        self.question = widgets.Text(placeholder=placeholder, description="Question:",
                                     layout=widgets.Layout(width="32em"))
        self.button = widgets.Button(description="Ask", button_style="primary")
        self.answer = widgets.HTML()
        self.button.on_click(lambda _: self.ask())
        self.view = widgets.VBox([widgets.HBox([self.question, self.button]), self.answer])

    def ask(self, question: str | None = None) -> str:
        """Answer `question` (default: the text box), show it and return it."""
        question = self.question.value if question is None else question
        self.question.value = question
        answer = self.predict([question or self.question.placeholder])[0]
        self.answer.value = f"<b>Answer:</b> {answer}"
        return answer

    def _ipython_display_(self):
        from IPython.display import display

        display(self.view)
