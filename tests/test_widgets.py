from t5nb.widgets import AskWidget


def test_ask_widget_shows_the_answer_of_the_predictor():
    asked = []

    def predict(questions):
        asked.extend(questions)
        return [q.upper() for q in questions]

    widget = AskWidget(predict, placeholder="who?")
    assert widget.ask("where was ada born?") == "WHERE WAS ADA BORN?"
    assert "WHERE WAS ADA BORN?" in widget.answer.value
    widget.question.value = ""
    widget.button.click()  # an empty box asks the placeholder question
    assert asked == ["where was ada born?", "who?"] and "WHO?" in widget.answer.value
